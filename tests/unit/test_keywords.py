"""PacTrain's keyword arguments, declared once (core.keywords), in every façade's signature."""

import inspect

import pytest

from pactrain_hvd.core.keywords import KEYWORDS, LOCAL_STEP_KEYWORDS, pactrain_keywords

FACADES = {  # module:name -> the keywords a façade leaves out
    "pactrain_hvd.torch.optimizer:DistributedOptimizer": (),
    "pactrain_hvd.torch.ddp:PacTrainHookState": ("masks", "continue_pruning", "values") + LOCAL_STEP_KEYWORDS,
    "pactrain_hvd.tensorflow.state:PacTrainState": (),
    "pactrain_hvd.tensorflow.keras.optimizer:DistributedOptimizer": (),
}


@pytest.mark.parametrize("path", sorted(FACADES))
def test_every_facade_signature_lists_the_declared_keywords_with_their_defaults(path):
    module, name = path.split(":")
    parameters = inspect.signature(getattr(pytest.importorskip(module), name)).parameters
    expected = {key: default for key, default in KEYWORDS.items() if key not in FACADES[path]}
    assert {key: parameters[key].default for key in expected} == expected
    assert all(parameters[key].kind is inspect.Parameter.KEYWORD_ONLY for key in expected)
    assert not set(FACADES[path]) & set(parameters), "a keyword the façade leaves out is in its signature"
    assert not [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]


def test_the_function_gets_every_keyword_and_an_unknown_one_is_named():
    @pactrain_keywords(without=("values",))
    def facade(model, process_group=None, **pactrain):
        return model, process_group, pactrain

    model, group, pactrain = facade("m", sparsity=0.5)
    assert (model, group) == ("m", None) and pactrain == dict(
        {key: default for key, default in KEYWORDS.items() if key != "values"}, sparsity=0.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'sparsty'"):
        facade("m", sparsty=0.5)
    with pytest.raises(TypeError, match="unexpected keyword argument 'values'"):
        facade("m", values="fp16")
