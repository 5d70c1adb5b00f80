"""``DistributedGradientTape``: ``hvd.DistributedGradientTape`` with pruning and packing, over a ``PacTrainState``."""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Any

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from horovod.tensorflow.compression import Compression, Compressor

from pactrain_hvd.core.config import horovod_op
from pactrain_hvd.core.encodings import packed_values_argument
from pactrain_hvd.core.keywords import LOCAL_STEP_KEYWORDS, documents_keywords
from pactrain_hvd.tensorflow.arguments import checked_arguments
from pactrain_hvd.tensorflow.pruning import backing_variable
from pactrain_hvd.tensorflow.state import PacTrainState

_HOROVOD_DEFAULTS = {"compression": Compression.none, "sparse_as_dense": False, "op": hvd.Average,
                     "gradient_predivide_factor": 1.0, "groups": None, "process_set": hvd.global_process_set,
                     "device_dense": "", "device_sparse": "", "scale_local_gradients": True}

_TAPE_STATES = "_pactrain_tape_states"  # attribute of a variable: the tape states of the sources it leads


def state_arguments(**kwargs: Any) -> dict[str, Any]:
    """All of ``PacTrainState``'s arguments (defaults filled in), checked without making one."""
    bound = inspect.signature(PacTrainState).bind(**kwargs)
    bound.apply_defaults()
    checked_arguments(**bound.arguments, stacklevel=5)  # the tape's caller; packed_values is read by then
    return dict(bound.arguments)


def _same(a: Any, b: Any) -> bool:
    """Argument equality across traces: a lambda written in the step is a new object per trace, same code."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, types.FunctionType):
        return a.__code__ is b.__code__
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[key], b[key]) for key in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _tape_state(sources: list[Any], arguments: dict[str, Any]) -> PacTrainState:
    """The state of tapes made without ``state=``: one per tuple of variables differentiated.

    Horovod's idiom wraps the tape inside the traced step, so every trace (and every eager step)
    makes a new tape; they all find the state the first one made (outside the trace), kept on the
    first variable, so it lives as long as the model does.
    """
    variables = [backing_variable(source) for source in sources]
    states = variables[0].__dict__.setdefault(_TAPE_STATES, {})
    key = tuple(variable.ref() for variable in variables)
    if key not in states:
        with tf.init_scope():
            states[key] = (arguments, PacTrainState(**arguments))
    made_with, state = states[key]
    differing = sorted(name for name in arguments if not _same(arguments[name], made_with[name]))
    if differing:
        raise ValueError(f"pt.DistributedGradientTape: these variables already have a PacTrainState made with other "
                         f"{', '.join(differing)}; to train them two ways, make each PacTrainState yourself and pass "
                         "it as state=")
    return state


@documents_keywords(without=LOCAL_STEP_KEYWORDS)
class DistributedGradientTape:
    """``hvd.DistributedGradientTape`` with pruning and mask-indexed packing, for Keras 3 and tf-keras.

    Takes every argument of ``hvd.DistributedGradientTape`` with the same defaults, plus PacTrain's keywords
    (but the local-step ones) and ``optimizer``. One ``gradient`` call is one step.

    The schedule and masks outlive the tape: Horovod's idiom, a tape wrapped on every step or in
    a ``tf.function`` (traced again for a new batch shape), keeps one ``PacTrainState`` per tuple
    of variables differentiated, found by the first ``gradient`` call (then ``pactrain_state``).
    Or pass ``state=`` (a ``PacTrainState`` you made) and leave the other arguments unset.

    With exact-zero gradients at pruned coordinates and slots cleared at mask changes (pass
    ``optimizer=``), Keras optimizers keep pruned weights at exactly 0.

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the step.
        device_dense: as Horovod: where dense all-reduces run.
        device_sparse: as Horovod: where sparse all-gathers run.
        compression: Horovod's compressor for tensors that travel dense (and packed values that inherit it).
        sparse_as_dense: as Horovod: densify sparse gradients (a pruned variable's must be dense).
        op: ``hvd.Average`` (default) or ``hvd.Sum``, ``hvd.Min``, ``hvd.Max``; not Adasum.
        gradient_predivide_factor: as Horovod: divide before the sum and multiply after.
        num_groups: deprecated, as Horovod: use ``groups``.
        groups: as Horovod; not with fp16 or quantized ``packed_values``.
        process_set: as Horovod: the ranks this tape reduces with.
        scale_local_gradients: as Horovod: gradients of local sources are scaled by 1/size.
        state: a ``PacTrainState`` to reduce with (then leave the other arguments unset).
        optimizer: the Keras optimizer whose slots are zeroed at newly pruned coordinates.
        {pactrain_keywords}

    Example::

        >>> @tf.function
        ... def train_step(x, y):
        ...     with tf.GradientTape() as tape:
        ...         loss = loss_fn(y, model(x, training=True))
        ...     tape = pt.DistributedGradientTape(tape, sparsity=0.9, end_step=1000, optimizer=opt)
        ...     grads = tape.gradient(loss, model.trainable_variables)
        ...     opt.apply_gradients(zip(grads, model.trainable_variables))
    """

    def __init__(
        self,
        gradtape: tf.GradientTape,
        device_dense: str = "",
        device_sparse: str = "",
        compression: type[Compressor] = Compression.none,
        sparse_as_dense: bool = False,
        op: Any = hvd.Average,
        gradient_predivide_factor: float = 1.0,
        num_groups: int = 0,
        groups: int | list | None = None,
        process_set: hvd.ProcessSet = hvd.global_process_set,
        scale_local_gradients: bool = True,
        state: PacTrainState | None = None,
        **pactrain: Any,
    ) -> None:
        if not isinstance(gradtape, tf.GradientTape):
            raise TypeError(f"gradtape must be a tf.GradientTape, got {type(gradtape).__name__}")
        if num_groups != 0:
            warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                          DeprecationWarning, stacklevel=2)
            groups = groups if groups is not None else num_groups
        horovod_args = dict(compression=compression, sparse_as_dense=sparse_as_dense, op=horovod_op(hvd, op),
                            gradient_predivide_factor=gradient_predivide_factor, groups=groups,
                            process_set=process_set, device_dense=device_dense, device_sparse=device_sparse,
                            scale_local_gradients=scale_local_gradients)
        if "packed_values" in pactrain or "values" in pactrain:
            # Checked and read (deprecated spellings too) once here, not again at every trace's state lookup.
            pactrain["packed_values"] = packed_values_argument(pactrain.pop("packed_values", "inherit"),
                                                               pactrain.pop("values", None))
        local_steps = sorted(set(LOCAL_STEP_KEYWORDS) & set(pactrain))
        if local_steps or (isinstance(state, PacTrainState) and state.config.sync_every > 1):
            raise ValueError(f"{', '.join(local_steps) or 'a state with sync_every > 1'}: local steps need the "
                             "optimizer's update between the reduction and the outer sync, which a tape does not "
                             "make; use pactrain_hvd.tensorflow.keras.DistributedOptimizer (in a custom loop too: a "
                             "plain tf.GradientTape, then optimizer.apply_gradients)")
        self._arguments: dict[str, Any] | None = None
        if state is None:
            self._arguments = state_arguments(**horovod_args, **pactrain)  # the state itself: at gradient()
        elif not isinstance(state, PacTrainState):
            raise TypeError(f"state must be a PacTrainState, got {type(state).__name__}")
        else:
            differing = [key for key, value in horovod_args.items()
                         if value != _HOROVOD_DEFAULTS[key] and value != getattr(state.reduction, key)] + sorted(pactrain)
            if differing:
                raise ValueError(f"state= was given, so {', '.join(differing)} must be left unset: the state has them")
        self._tape = gradtape
        self._state = state
        self._local_sources: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        if name == "_tape":
            raise AttributeError(name)
        return getattr(self._tape, name)  # watch, stop_recording, reset, jacobian...

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._tape.__exit__(*exc_info)

    @property
    def pactrain_state(self) -> PacTrainState:
        """Schedule position, masks and statistics of this tape's variables."""
        if self._state is None:
            raise RuntimeError("pactrain_state: made without state=, this tape finds its PacTrainState (one per tuple "
                               "of variables) at its first gradient() call; read it after that, or pass state=")
        return self._state

    def register_local_source(self, source: Any) -> None:
        """Gradients of ``source`` are not reduced (scaled by 1/size if ``scale_local_gradients``)."""
        self._local_sources.append(source)
        if self._state is not None:
            self._state.register_local(source)

    def masks(self) -> dict[str, np.ndarray]:
        return self.pactrain_state.masks()

    def stats(self) -> dict:
        return self.pactrain_state.stats()

    @tf.autograph.experimental.do_not_convert
    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE) -> Any:
        gradients = self._tape.gradient(target, sources, output_gradients=output_gradients,
                                        unconnected_gradients=unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        if not flat_sources:
            return gradients
        if self._state is None:
            self._state = _tape_state(flat_sources, self._arguments)
            for source in self._local_sources:
                self._state.register_local(source)
        reduced = self._state.reduce(tf.nest.flatten(gradients), flat_sources)
        return tf.nest.pack_sequence_as(gradients, reduced)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None) -> tuple[list[tuple], list[tuple]]:
        """As Horovod's: ``gradient``, split into ``[(source, gradient)]`` of local sources and of the others."""
        flat_sources = tf.nest.flatten(sources)
        pairs = list(zip(flat_sources, tf.nest.flatten(self.gradient(target, sources, output_gradients))))
        is_local = [self._state is not None and self._state.is_local(source) for source in flat_sources]
        return ([pair for pair, local in zip(pairs, is_local) if local],
                [pair for pair, local in zip(pairs, is_local) if not local])


def _partial_signature() -> inspect.Signature:
    """``hvd.PartialDistributedGradientTape``'s signature: the tape's, with ``local_layers`` before
    ``scale_local_gradients`` (Horovod's order) and no ``state``."""
    tape = inspect.signature(DistributedGradientTape.__init__)
    parameters = [p for name, p in tape.parameters.items() if name not in ("self", "state")]
    at = [p.name for p in parameters].index("scale_local_gradients")
    parameters.insert(at, inspect.Parameter("local_layers", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None))
    return tape.replace(parameters=parameters, return_annotation="DistributedGradientTape")


_PARTIAL_SIGNATURE = _partial_signature()


def PartialDistributedGradientTape(*args: Any, **kwargs: Any) -> DistributedGradientTape:  # noqa: N802 - Horovod's name
    """``hvd.PartialDistributedGradientTape``: the trainable weights of ``local_layers`` are local sources.

    The rest as ``DistributedGradientTape``, PacTrain keyword arguments (``sparsity=...``) too; the Horovod
    arguments are Horovod's, as ``hvd.PartialDistributedGradientTape``.

    Args:
        gradtape: the ``tf.GradientTape`` that recorded the computation.
        device_dense: device for dense gradients' reductions, as Horovod's.
        device_sparse: device for sparse gradients' reductions, as Horovod's.
        compression: Horovod compressor of the values that travel, as Horovod's.
        sparse_as_dense: reduce ``tf.IndexedSlices`` gradients as dense tensors, as Horovod's.
        op: the reduce op, as Horovod's (``hvd.Average``, ``hvd.Sum``, ``hvd.Min`` or ``hvd.Max``).
        gradient_predivide_factor: with ``hvd.Average``, divide by it before the sum and by ``size / it`` after.
        num_groups: deprecated spelling of ``groups``.
        groups: how gradients' all-reduces are grouped (a count, or lists of variables), as Horovod's.
        process_set: the Horovod process set that reduces.
        local_layers: a Keras layer or a list of them whose trainable weights are not reduced; None: none.
        scale_local_gradients: scale local sources' gradients by ``1 / size``, as Horovod's.

    Returns:
        A ``DistributedGradientTape`` with the weights of ``local_layers`` registered as local sources.

    Raises:
        ValueError: ``local_layers`` is not a Keras layer or a list of them.
    """
    arguments = _PARTIAL_SIGNATURE.bind(*args, **kwargs).arguments
    local_layers = arguments.pop("local_layers", None)
    pactrain = arguments.pop("pactrain", {})
    layers = [] if local_layers is None else [local_layers] if hasattr(local_layers, "trainable_weights") \
        else list(local_layers)
    if not all(hasattr(layer, "trainable_weights") for layer in layers):
        raise ValueError("local_layers must be a Keras layer or a list of Keras layers")
    tape = DistributedGradientTape(**arguments, **pactrain)
    for layer in layers:
        for weight in layer.trainable_weights:
            tape.register_local_source(weight)
    return tape


PartialDistributedGradientTape.__signature__ = _PARTIAL_SIGNATURE
