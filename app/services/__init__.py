"""Use-case services: each takes keyword-only ``*, session`` and owns one piece of logic."""
