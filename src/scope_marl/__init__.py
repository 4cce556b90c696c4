"""SCOPE-MARL: RL for LLM agents against populations of LLM user simulators."""
