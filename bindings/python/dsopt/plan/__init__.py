"""dsopt.plan: will it help on my cluster? Predicts, for every dsopt
configuration (every algorithm the library registers, on each gradient
path its description allows), the bytes each rank sends per step and the memory it holds
(exactly as the library counts them), and the step time split into
compute, update, compression and exposed communication, from a profile
calibrated on this machine and an alpha-beta model of the network.

    from dsopt import plan
    records = plan.plan(plan.Model.from_params(1.3e9, "bf16"), plan.Cluster.parse(64, 8, inter="25gbit"),
                        compute=0.35, profile=plan.load_profile())
    best, why = plan.choose(records)

``python -m dsopt.plan --help`` is the command; docs/guides/planner.md the guide."""

from .calibrate import measure_compute, measure_network
from .algorithms import describe as describe_algorithm, names as algorithm_names
from .configs import Config, Settings, all_configs, by_name, configs_of
from .model import Model
from .network import Cluster
from .planner import Record, choose, plan
from .profile import Profile, load as load_profile, save as save_profile
from . import fsdp  # noqa: F401  (registers the FSDP2 and HSDP paths: paths.py)

__all__ = ["Config", "Settings", "all_configs", "by_name", "configs_of", "algorithm_names", "describe_algorithm",
           "Model", "Cluster", "Record", "choose", "plan", "Profile", "load_profile", "save_profile", "measure_compute", "measure_network"]
