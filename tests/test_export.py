"""Deployment: torch.export with a dynamic batch, ONNX through the exporter torch recommends
(`torch.onnx.export(..., dynamo=True)`), and TorchScript tracing.

Every registered model (`vit_pytorch.models.MODELS`), built from its row of the conformance table
(tests/test_conformance.py, the row named like the model), exports
with torch.export at a batch of 2 and runs at other batches, and exports to ONNX and runs in
onnxruntime (the registry sweep below: `pytest -m slow`; one model of each family in the default
run). NaViT exports for a (b, c, h, w) tensor batch; a list of images (its packing) is Python-level
control flow that no exporter follows. ViViT's and the others' optional arguments (a frame `mask`)
are not part of the exported signature.

TorchScript: `torch.jit.trace` works and is tested, for users who still ship TorchScript.
`torch.jit.script` is not supported: torch 2.13 deprecates both (it points to torch.export and
torch.compile), and scripting cannot compile keyword-only arguments with defaults or einops
patterns, which every model here uses. Use torch.export (or ONNX) instead.
"""

import inspect
import warnings

import pytest
import torch

import test_conformance as conformance
from test_properties import MODELS
from vit_pytorch import models

EXPORTABLE = [spec for spec in MODELS if spec.name in ('vit', 'simple_vit')]
export_table = pytest.mark.parametrize('spec', EXPORTABLE, ids=lambda spec: spec.name)


def build(spec):
    torch.manual_seed(0)
    return spec.build(**spec.example).eval()


def images(spec, batch):
    return torch.randn(batch, *spec.image_shape(spec.example), generator=torch.Generator().manual_seed(batch))


def export(model, spec):
    batch = torch.export.Dim('batch', min=1, max=1024)
    return torch.export.export(model, (images(spec, 2),), dynamic_shapes={'img': {0: batch}})


@pytest.fixture(scope='module')
def programs():
    """name -> exported program of build(spec), made once (exporting takes seconds)."""
    cache = {}

    def program(spec):
        if spec.name not in cache:
            cache[spec.name] = export(build(spec), spec)
        return cache[spec.name]
    return program


@export_table
def test_exported_program_matches_eager_for_every_batch_size(spec, programs):
    model = build(spec)
    exported = programs(spec).module()
    for batch in (1, 2, 5):
        img = images(spec, batch)
        with torch.no_grad():
            torch.testing.assert_close(exported(img), model(img), rtol=1e-5, atol=1e-6)


@export_table
def test_exported_program_keeps_the_batch_dimension_symbolic(spec, programs):
    program = programs(spec)
    (placeholder,) = [node for node in program.graph.nodes
                      if node.op == 'placeholder' and node.name not in program.graph_signature.inputs_to_parameters
                      and node.name not in program.graph_signature.inputs_to_buffers]
    batch, *rest = placeholder.meta['val'].shape
    assert isinstance(batch, torch.SymInt)
    assert rest == list(spec.image_shape(spec.example))


@export_table
def test_exported_program_survives_save_and_load(spec, programs, tmp_path):
    model = build(spec)
    torch.export.save(programs(spec), tmp_path / 'model.pt2')
    loaded = torch.export.load(tmp_path / 'model.pt2').module()
    img = images(spec, 3)
    with torch.no_grad():
        torch.testing.assert_close(loaded(img), model(img), rtol=1e-5, atol=1e-6)


@pytest.fixture(scope='module')
def onnx_files(tmp_path_factory):
    """One ONNX export per model (the exporter takes seconds), shared by the ONNX tests."""
    pytest.importorskip('onnxscript', reason='torch.onnx.export(dynamo=True) needs onnxscript')
    folder = tmp_path_factory.mktemp('onnx')
    files = {}
    for spec in EXPORTABLE:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            program = torch.onnx.export(build(spec), (images(spec, 2),), dynamo=True, verbose=False,
                                        input_names=['img'], output_names=['logits'],
                                        dynamic_shapes={'img': {0: 'batch'}})
        files[spec.name] = folder / f'{spec.name}.onnx'
        program.save(str(files[spec.name]))
    return files


@export_table
def test_onnx_model_is_valid_and_has_a_dynamic_batch(spec, onnx_files):
    onnx = pytest.importorskip('onnx')
    graph = onnx.load(str(onnx_files[spec.name]))
    onnx.checker.check_model(graph)
    (img,) = graph.graph.input
    batch, *rest = img.type.tensor_type.shape.dim
    assert batch.dim_param and not batch.HasField('dim_value')
    assert [dim.dim_value for dim in rest] == list(spec.image_shape(spec.example))


@export_table
def test_onnxruntime_matches_eager(spec, onnx_files):
    ort = pytest.importorskip('onnxruntime')
    model = build(spec)
    session = ort.InferenceSession(str(onnx_files[spec.name]), providers=['CPUExecutionProvider'])
    for batch in (1, 4):
        img = images(spec, batch)
        (logits,) = session.run(None, {'img': img.numpy()})
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(logits), model(img), rtol=1e-4, atol=1e-4)


@export_table
def test_traced_model_matches_eager_for_another_batch_size(spec):
    model = build(spec)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')          # deprecation and the tracer's notes on Python-level checks
        traced = torch.jit.trace(model, (images(spec, 2),))
    for batch in (1, 3):
        img = images(spec, batch)
        with torch.no_grad():
            torch.testing.assert_close(traced(img), model(img), rtol=1e-5, atol=1e-6)


@export_table
def test_torch_jit_script_is_unsupported_as_documented(spec):
    """If scripting starts to work, this fails: then test it and update the module docstring."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        with pytest.raises(torch.jit.frontend.NotSupportedError, match='keyword-only arguments'):
            torch.jit.script(build(spec))


# the registry sweep: every registered model, the trainer's small configuration of it

# the sweep takes every registered model at its row of the conformance table (tests/test_conformance.py: the row
# named like the model), in eval mode. One of each family in the default run (ViT and SimpleViT have the tests
# above): multi-scale windows, a convolutional tokenizer, signals, video; the rest with `pytest -m slow` (an ONNX
# export takes seconds)
DEFAULT_SWEEP = ('swin', 'cct', 'vit_1d', 'vivit')
# models that cannot export with a dynamic batch, and why (measured, torch 2.13): these pack every item of a
# batch into one sequence in Python (a segment per item, as vit-pytorch's nested tensors hold them), so
# torch.export specialises the batch to the example's 2 (ConstraintViolationError); `na_vit` is the exportable NaViT
PACKED = 'packs each item into one sequence in Python: the batch is specialised to a constant'
NO_DYNAMIC_BATCH = {'na_vit_nested_tensor': PACKED, 'na_vit_nested_tensor_3d': PACKED}
sweep = pytest.mark.parametrize('name', [
    pytest.param(name, marks=([] if name in DEFAULT_SWEEP else [pytest.mark.slow])
                 + ([pytest.mark.xfail(reason=NO_DYNAMIC_BATCH[name], strict=True)] if name in NO_DYNAMIC_BATCH else []))
    for name in sorted(models.MODELS)])


def sweep_model(name):
    return conformance.build(name)[0].eval()


def sweep_inputs(name, batch):
    return conformance.CASES[name].make_input(torch.Generator().manual_seed(batch), batch=batch)


def input_name(model):
    return next(iter(inspect.signature(model.forward).parameters))


@sweep
def test_registered_model_exports_with_a_dynamic_batch(name):
    model = sweep_model(name)
    batch = torch.export.Dim('batch', min=1, max=1024)
    program = torch.export.export(model, (sweep_inputs(name, 2),), dynamic_shapes={input_name(model): {0: batch}})
    for size in (1, 3):
        x = sweep_inputs(name, size)
        with torch.no_grad():
            # the exported graph runs the eager kernels: equal up to a batch-dependent choice of kernel blocking
            torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-6)


@sweep
def test_registered_model_runs_in_onnxruntime_with_a_dynamic_batch(name, tmp_path):
    pytest.importorskip('onnxscript', reason='torch.onnx.export(dynamo=True) needs onnxscript')
    ort = pytest.importorskip('onnxruntime')
    model = sweep_model(name)
    argument = input_name(model)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        program = torch.onnx.export(model, (sweep_inputs(name, 2),), dynamo=True, verbose=False,
                                    input_names=[argument], dynamic_shapes={argument: {0: 'batch'}})
    program.save(str(tmp_path / f'{name}.onnx'))
    session = ort.InferenceSession(str(tmp_path / f'{name}.onnx'), providers=['CPUExecutionProvider'])
    for size in (1, 3):
        x = sweep_inputs(name, size)
        (logits,) = session.run(None, {argument: x.numpy()})
        with torch.no_grad():
            expected = model(x)
        # onnxruntime computes in float32 with its own kernels (GEMM blocking, fused norms and softmax): a few
        # ulps an op, within 1.5e-6 of the largest logit over the whole registry (measured), against 1e-4 here;
        # a wrong operator is off by the logits' own size. LeViT's logits are ~3e-4, hence relative to them
        bound = 1e-4 * expected.abs().max().item()
        assert (torch.from_numpy(logits) - expected).abs().max().item() <= bound
