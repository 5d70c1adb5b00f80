"""Should I use PacTrain on my cluster? Bytes, step time and time to accuracy per method, on paper.

Framework-free (numpy and plain Python; torch only to read a model's shapes, or to ``--profile`` it):

- ``methods``: the methods compared, by name, and where their accuracy curves hold for any number of workers;
- ``payload``: bytes a worker hands the collectives per step, from the parameter shapes;
- ``step_model``: ring collectives, Horovod's cycle and fusion, overlap with backward;
- ``coordination``: Horovod's traffic besides the gradients (per cycle, per step) sharing the link;
- ``step_time``: a method's step on ``n`` workers and a link, and its scaling efficiency;
- ``curves``: steps to a target from accuracy curves (time to accuracy = steps x step time);
- ``virtual``: Top-k's and ternary's per-worker arithmetic on ``N`` workers' gradients in one process;
- ``models``, ``profile``: a model's shapes (on torch's meta device) and its measured costs;
- ``recommend``, ``cli``: the table, the pick and its reason (``pactrain-plan``).
"""

from pactrain_hvd.planner.coordination import Coordination
from pactrain_hvd.planner.curves import Curve, Curves, load_curves
from pactrain_hvd.planner.methods import DEFAULT_METHODS, Method, parse_method
from pactrain_hvd.planner.payload import Tensor, Traffic, traffic
from pactrain_hvd.planner.step_model import HorovodConfig, Link, ring_allgather_s, ring_allreduce_s
from pactrain_hvd.planner.step_time import Costs, Prediction, predict
from pactrain_hvd.planner.virtual import VirtualWorkers

__all__ = ["Coordination", "Costs", "Curve", "Curves", "DEFAULT_METHODS", "HorovodConfig", "Link", "Method", "Prediction", "Tensor",
           "Traffic", "VirtualWorkers", "load_curves", "parse_method", "predict", "ring_allgather_s", "ring_allreduce_s", "traffic"]
