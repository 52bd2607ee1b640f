"""Running an experiment: the command line, the config and plan, servers, the window loop, run.json."""
