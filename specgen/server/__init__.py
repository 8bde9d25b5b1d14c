"""`specgen serve`: the scheduler (no HTTP here) and, from the HTTP side, the routes."""
