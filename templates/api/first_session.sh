BASE=http://127.0.0.1:8000   # where priorly serves (scripts/serve)
STUDY=ces                    # the demo study's slug

# 1. An API key. The demo study has no owner, so the key is an admin's (an admin sees
#    every study); for your own studies, a researcher's key. Run where the server runs
#    (same PRIORLY_DATABASE_URL). The key is printed once.
priorly user create --email you@example.org --admin
KEY=$(priorly apikey create --email you@example.org)

# 2. What the study asks: its items with their role and options. Attribute items are
#    what your product may already know about the user (send them as "attributes").
curl -sS --fail-with-body "$BASE/api/v1/studies/$STUDY" -H "Authorization: Bearer $KEY" \
  | jq -c '.items[] | select(.role == "attribute") | {key, options: [.options[].letter]}'

# 3. Start a session (external_id: your id for the user, unique in the study). The answer
#    holds the first question and the session's token (shown once): the respondent's
#    client uses the token, not your key. On a server started a moment ago the demo's
#    model is still being fitted (a few minutes): the answer is then 409 model_preparing
#    with a Retry-After header; run this step again after that many seconds.
curl -sS --fail-with-body -X POST "$BASE/api/v1/studies/$STUDY/sessions" \
  -H "Authorization: Bearer $KEY" -H "Content-Type: application/json" \
  -d "{\"external_id\": \"curl-$(date +%s)\"}" > session.json
jq '{session_id, question}' session.json
SESSION=$(jq -r .session_id session.json)
TOKEN=$(jq -r .token session.json)

# 4. The question waiting for an answer (item key, text, options).
curl -sS --fail-with-body "$BASE/api/v1/sessions/$SESSION" \
  -H "Authorization: Bearer $TOKEN" > question.json
jq .question question.json

# 5. Answer it (here with its first option). The reply is the next question and
#    "replayed": false. A retry with the same idempotency_key returns the same reply with
#    "replayed": true (and the header Idempotent-Replayed: true).
ITEM=$(jq -r .question.item question.json)
OPTION=$(jq -r '.question.options[0].letter' question.json)
curl -sS --fail-with-body -X POST "$BASE/api/v1/sessions/$SESSION/answers" \
  -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
  -d "{\"item\": \"$ITEM\", \"option\": \"$OPTION\", \"idempotency_key\": \"curl-1-a1\"}" \
  | jq '{questions_answered, replayed, question}'

# 6. What the model now predicts for the study's targets and every unanswered item,
#    and the respondent's profile.
curl -sS --fail-with-body "$BASE/api/v1/sessions/$SESSION/predictions" \
  -H "Authorization: Bearer $TOKEN" | jq '{answers, targets: .targets[:2], predicted: .predicted[:2]}'
curl -sS --fail-with-body "$BASE/api/v1/sessions/$SESSION/profile" \
  -H "Authorization: Bearer $TOKEN" | jq '{answers, summary}'

# 7. Results with the key: the studies it may see, then the responses and predictions
#    page by page (pass next_cursor as ?cursor= until it is null).
curl -sS --fail-with-body "$BASE/api/v1/studies" -H "Authorization: Bearer $KEY" | jq .
curl -sS --fail-with-body "$BASE/api/v1/studies/$STUDY/responses?limit=2" \
  -H "Authorization: Bearer $KEY" | jq '{responses: [.responses[].respondent_id], next_cursor}'
curl -sS --fail-with-body "$BASE/api/v1/studies/$STUDY/predictions?limit=1" \
  -H "Authorization: Bearer $KEY" | jq '.predictions[0].targets[0]'
