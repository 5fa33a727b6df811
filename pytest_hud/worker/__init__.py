"""The xdist worker's side of the plugin (also the single process under ``-n 0``): its runtest
hooks, its session (pool link, bridges, policies, recorders), the fixtures, and how an episode
test's outcome becomes a record. Never imports the controller."""
