"""pytest collects nothing here: a cooperative-coding task in CooperBench's layout and its upstream
repository (test data of tests/test_coop_runtimes.py), whose own tests run only through the task's
runner.sh."""

collect_ignore_glob = ["*"]
