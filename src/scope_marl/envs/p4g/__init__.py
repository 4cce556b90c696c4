"""Persuasion for Good (Wang et al. 2019): corpus, personas, split, donation reward, environment."""

from scope_marl.envs.p4g.donation import episode_donation, parse_donation
from scope_marl.envs.p4g.env import PersuasionForGood

__all__ = ["PersuasionForGood", "episode_donation", "parse_donation"]
