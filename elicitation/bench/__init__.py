"""The benchmark harness: replay real respondents (individual) and measure live-step speed.

``elicitation.bench.individual.run_individual`` runs the individual protocol and
``elicitation.bench.speed.run_speed`` the latency benchmark; ``elicitation.bench.methods``
holds the registry of benchmark methods. Imports are left to the submodules so that
importing the package stays cheap.
"""
