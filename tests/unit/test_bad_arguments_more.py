"""More constructor arguments, one process: refused at construction with the argument named (not deep inside
Horovod, torch or TensorFlow at the first step), or accepted where Horovod accepts them.

Rows of docs/reliability.md, "Bad input"; the earlier ones are in test_torch_bad_input.py and test_tf_bad_input.py.
Each comment says what the case did before.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.torch as hvd  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import pactrain_hvd.torch as pt  # noqa: E402
from pactrain_hvd.torch.ddp import PacTrainHookState  # noqa: E402


@pytest.fixture(scope="module")
def horovod():
    """Requested by the torch tests, which run after the TensorFlow ones: Horovod's TF instance is then initialised
    before its torch one, in this module as in the whole unit suite (test_tf_* before test_torch_*); the other order
    now and then crashes the process at exit, when both shut down."""
    hvd.init()


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))


def optimizer(net=None, **kwargs):
    net = net or model()
    named = kwargs.pop("named_parameters", net.named_parameters())
    return pt.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), named_parameters=named, **kwargs)


# -- TensorFlow PacTrainState, DistributedGradientTape, Keras DistributedOptimizer ---------------------------

@pytest.fixture(scope="module")
def tf_frontend():
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    hvd_tf = pytest.importorskip("horovod.tensorflow")
    hvd_tf.init()
    import pactrain_hvd.tensorflow as tpt
    import pactrain_hvd.tensorflow.keras as ptk
    return tf, keras, hvd_tf, tpt, ptk


@pytest.mark.parametrize("make, error, message", [
    pytest.param(lambda tf, w: dict(device_dense=5), TypeError,  # accepted; AttributeError in tf.device at a step
                 r"device_dense must be a device name such as '/gpu:0' \('': where TensorFlow places it\), "
                 r"got 5 \(int\)", id="device_dense"),
    pytest.param(lambda tf, w: dict(device_sparse=b"/cpu:0"), TypeError,  # accepted, as device_dense
                 r"device_sparse must be a device name .* got b'/cpu:0' \(bytes\)", id="device_sparse"),
    pytest.param(lambda tf, w: dict(groups=[[tf.zeros(3)]]), TypeError,  # accepted; TypeError at a reduction
                 r"groups must consist of tf.Variable \(or Keras variables\), got EagerTensor", id="groups-tensor"),
    pytest.param(lambda tf, w: dict(groups=[[w], [w]]), ValueError,  # accepted: the last group won
                 "a variable can only appear once in groups: w", id="groups-twice"),
    pytest.param(lambda tf, w: dict(groups=[1, 2]), ValueError,  # the same error, without what was given
                 r"list of lists of tf.Variable, got int at groups\[0\]", id="groups-list-of-ints"),
    pytest.param(lambda tf, w: dict(op="Average"), ValueError,  # op='Average' is not supported with packing
                 r"op must be one of Horovod's reduce ops, .*got 'Average' \(str\)", id="op-not-an-op"),
])
def test_tf_facades_refuse_at_construction_naming_the_argument(tf_frontend, make, error, message):
    tf, keras, _, tpt, ptk = tf_frontend
    kwargs = make(tf, tf.Variable(tf.zeros(3), name="w"))
    facades = [lambda: tpt.PacTrainState(**kwargs), lambda: tpt.DistributedGradientTape(tf.GradientTape(), **kwargs)]
    if "op" not in kwargs:  # the Keras optimizer has Horovod's own op check
        facades.append(lambda: ptk.DistributedOptimizer(keras.optimizers.SGD(), **kwargs))
    for facade in facades:
        with pytest.raises(error, match=message):
            facade()


def test_tf_state_refuses_an_optimizer_that_is_not_one(tf_frontend):
    tpt = tf_frontend[3]  # accepted: its slots were never cleared at pruned coordinates
    with pytest.raises(TypeError, match=r"optimizer must be the Keras optimizer whose slots \(momentum, Adam "
                                        r"moments\) are cleared at pruned coordinates, or None, got 'sgd' \(str\)"):
        tpt.PacTrainState(optimizer="sgd")


def test_tf_op_none_is_average_as_horovod_reads_it(tf_frontend):
    tf, _, hvd_tf, tpt, _ = tf_frontend
    assert tpt.PacTrainState(op=None).reduction.op == hvd_tf.Average  # ValueError: op=None is not supported with packing
    w = tf.Variable(tf.ones((4, 3)))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.ones((2, 4)) @ w)
    tape = tpt.DistributedGradientTape(tape, op=None, sparsity=0.0)
    assert tape.gradient(loss, [w])[0].shape == (4, 3)
    assert tape.pactrain_state.reduction.op == hvd_tf.Average


def test_tf_groups_as_a_numpy_integer_is_accepted_as_horovod_accepts_it(tf_frontend):
    state = tf_frontend[3].PacTrainState(groups=np.int64(2))  # ValueError: groups should be a positive integer ...
    assert state.reduction.groups == 2 and type(state.reduction.groups) is int


# -- torch DistributedOptimizer ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    pytest.param(dict(process_set="global"), TypeError,  # AttributeError: 'str' object has no attribute 'size'
                 r"process_set must be a horovod ProcessSet \(hvd.global_process_set, or one made by "
                 r"hvd.add_process_set\), got str", id="process_set"),
    pytest.param(dict(groups=[1, 2]), ValueError,  # TypeError: 'int' object is not iterable, from the engine
                 r"groups given as a list must be a list of lists of torch.Tensor, got int at groups\[0\]",
                 id="groups-list-of-ints"),
    pytest.param(dict(op="Average"), ValueError,  # op='Average' is not supported with packing: as if an op
                 r"op must be one of Horovod's reduce ops, hvd.Average, hvd.Sum, hvd.Min or hvd.Max, "
                 r"got 'Average' \(str\)", id="op-not-an-op"),
    pytest.param(dict(masks={"0.weight": "x"}), TypeError,  # TypeError: new(): invalid data type 'str'
                 "mask for '0.weight' must be a bool tensor or array with data, got str", id="mask-value"),
])
def test_torch_optimizer_refuses_at_construction_naming_the_argument(horovod, kwargs, error, message):
    with pytest.raises(error, match=message):
        optimizer(**kwargs)


def test_torch_parameter_names_must_be_strings(horovod):
    net = model()  # AttributeError: 'int' object has no attribute 'endswith'
    with pytest.raises(TypeError, match=r"parameter names in named_parameters must be strings, got 0 \(int\)"):
        optimizer(net, named_parameters=[(i, p) for i, p in enumerate(net.parameters())])


def test_torch_op_none_is_average_as_horovod_reads_it(horovod):
    assert optimizer(op=None).op == hvd.Average  # ValueError: op=None is not supported with packing


def test_torch_groups_as_a_numpy_integer_is_accepted_as_horovod_accepts_it(horovod):
    opt = optimizer(groups=np.int64(2))  # ValueError: groups should be a positive integer ...
    assert len(set(opt._groups.values())) == 2


def test_torch_compressor_instance_is_accepted_as_horovod_accepts_it(horovod):
    net = model()  # TypeError: compression must be a Horovod compressor ... (its methods are static: it works)
    opt = optimizer(net, compression=hvd.Compression.fp16(), sparsity=0.5, begin_step=0, end_step=0)
    opt.zero_grad()
    net(torch.randn(8, 64)).sum().backward()
    opt.step()
    assert opt.masks()


# -- DDP comm hook state -----------------------------------------------------------------------------------

def test_ddp_hook_state_refuses_a_process_group_of_the_wrong_type():
    net = model()  # AttributeError: 'str' object has no attribute 'size', inside torch.distributed
    with pytest.raises(TypeError, match=r"process_group must be a torch.distributed.ProcessGroup .* or None for the "
                                        r"default group, got 'world' \(str\)"):
        PacTrainHookState(net, torch.optim.SGD(net.parameters(), lr=0.1), process_group="world")
