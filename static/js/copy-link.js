// "Copy" buttons of the admin studies list: <button data-copy="URL" data-status="ID">
// copies URL to the clipboard and says so in the live region #ID.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const text = button.dataset.copy;
  const status = document.getElementById(button.dataset.status);
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch (_err) {
    const field = document.getElementById(button.getAttribute("aria-controls"));
    if (field) {
      field.select();
      ok = document.execCommand("copy");
    }
  }
  if (status) status.textContent = ok ? "Link copied" : "Select the link and copy it";
});
