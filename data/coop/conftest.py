"""pytest collects nothing here: these are the toy repositories' own tests, run by each task's runner.sh
in a sandbox (a feature's tests need its gold code applied first), never as this project's tests.
To run a base repository's tests: cd data/coop/REPO/repo && python -m unittest discover -s tests -t ."""

collect_ignore_glob = ["*"]
