"""Ways of supplying the user side of a conversation: one small class per mode.

frozen (FrozenSimulator), persona-guided (persona_guided), rotation (Rotation), Verbalized Sampling
(VerbalizedSampling), trainable (TrainableSimulator) and population (PopulationSimulator over a
SimulatorPool). All share the Simulator protocol, generic over the reply type.
"""

from scope_marl.simulators.base import Response, Simulator, SimulatorTurn
from scope_marl.simulators.frozen import FrozenSimulator, LLMSimulator
from scope_marl.simulators.persona_guided import PERSONA_GUIDANCE, persona_guided
from scope_marl.simulators.pool import PoolMember, SimulatorPool
from scope_marl.simulators.population import PopulationSimulator
from scope_marl.simulators.rotation import Rotation
from scope_marl.simulators.trainable import TrainableSimulator
from scope_marl.simulators.verbalized import Candidate, VerbalizedSampling, parse_candidates

__all__ = [
    "PERSONA_GUIDANCE",
    "Candidate",
    "FrozenSimulator",
    "LLMSimulator",
    "PoolMember",
    "PopulationSimulator",
    "Response",
    "Rotation",
    "Simulator",
    "SimulatorPool",
    "SimulatorTurn",
    "TrainableSimulator",
    "VerbalizedSampling",
    "parse_candidates",
    "persona_guided",
]
