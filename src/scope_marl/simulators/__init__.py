"""Ways of supplying the user side of a conversation: one small class per mode."""

from scope_marl.simulators.base import Simulator, SimulatorTurn
from scope_marl.simulators.frozen import FrozenSimulator

__all__ = ["FrozenSimulator", "Simulator", "SimulatorTurn"]
