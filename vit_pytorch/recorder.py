"""Looking inside a model: attention maps, final embeddings and intermediate features.

One mechanism for every model of the package. Attention modules share a protocol: a
boolean attribute `fused` (True: `scaled_dot_product_attention`) and a child
`attention_probs` (an identity) through which the explicit path passes its
(b, heads, n_query, n_key) softmax. While a `Recorder` records, it sets `fused=False` on
every such module and hooks `attention_probs`; afterwards it restores `fused` and removes
its hooks, so the fused path outside recording is untouched and costs nothing.

    import torch
    from vit_pytorch import ViT
    from vit_pytorch.recorder import Recorder, Extractor, forward_intermediates

    model = ViT(image_size=32, patch_size=8, num_classes=10, dim=64, depth=3, heads=4, mlp_dim=128).eval()
    img = torch.randn(2, 3, 32, 32)

    logits, attns = Recorder(model)(img)         # attns: (2, 3 layers, 4 heads, 17, 17)

    with Recorder(model) as recorder:            # or as a context manager around any call
        logits = model(img)
    attns, grid, prefix = recorder.attentions, recorder.grid, recorder.num_prefix_tokens   # (4, 4), 1

    logits, tokens = Extractor(model)(img)       # tokens after the final norm: (2, 17, 64)
    maps = forward_intermediates(model, img, indices=[0, 2], output='maps')   # 2 x (2, 64, 4, 4)
"""

import inspect

import torch
from einops import rearrange
from torch import nn

from vit_pytorch.vit import block_outputs, token_layout  # noqa: F401  (defined beside the token face)

__all__ = ['Recorder', 'Extractor', 'forward_intermediates', 'block_outputs', 'attention_modules', 'token_layout']


def attention_modules(model):
    """[(name, module)] of every module that follows the attention protocol, in definition order."""
    return [
        (name, module) for name, module in model.named_modules()
        if isinstance(getattr(module, 'fused', None), bool)
        and isinstance(getattr(module, 'attention_probs', None), nn.Module)
    ]


class _Hooks(nn.Module):
    """Shared mechanics: hooks live only between `start()` and `stop()` (or inside `with`)."""

    def __init__(self, model):
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self._handles = []

    @property
    def recording(self):
        return bool(self._handles)

    def _install(self):
        raise NotImplementedError

    def _uninstall(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def start(self):
        if self.recording:
            raise RuntimeError(f"this {type(self).__name__} is already recording; call stop() first")
        try:
            self._install()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        self._uninstall()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    def eject(self):
        """Stop recording and hand back the model, as vit-pytorch's wrappers do."""
        self.stop()
        return self.model

    def _run(self, *args, **kwargs):
        if self.recording:
            return self.model(*args, **kwargs)
        with self:
            return self.model(*args, **kwargs)


class Recorder(_Hooks):
    """Record every attention map of `model`.

    `Recorder(model)(img)` returns `(logits, attns)`: attns is (b, layers, heads, n, n) when
    every recorded map has the same shape, and otherwise (CaiT's class attention is
    (b, heads, 1, n), XCiT's cross-covariance attention (b, heads, d, d), the two branches
    of CrossViT differ in n) a list with one (b, heads, n_query, n_key) tensor per call of
    an attention module, in the order they ran. `recorder.names` gives each map's module
    name, `recorder.maps` always the list.

    As a context manager it records every call of the model made inside it; the maps are
    those of the model's latest call. `recorder.grid` and `recorder.num_prefix_tokens` say
    how the keys of the last map (the model's final token sequence: [cls, patches] also for
    CaiT and XCiT) lie on the image, or None; for maps of other layers use
    `token_layout(model, recorder.image_size, n)`.

    Maps are detached from the graph unless `detach=False`. Layer dropout (CaiT) or
    anything else that skips layers in training mode skips their maps too: record in
    `model.eval()` for one map per layer. `device`, vit-pytorch's second argument, moves the
    maps there before they are stacked (None: they stay where the model made them). The model is
    the first argument, by keyword `vit=` (vit-pytorch's name) or `model=`.
    """

    def __init__(self, vit=None, device=None, *, model=None, detach=True):
        if (vit is None) == (model is None):
            raise TypeError(f"Recorder takes the model once, as its first argument, vit= (vit-pytorch's keyword) or "
                            f"model=; got vit={type(vit).__name__} and model={type(model).__name__}")
        super().__init__(model if vit is None else vit)
        self.device = None if device is None else torch.device(device)
        self.detach = detach
        self.maps, self.names = [], []
        self.image_size = None
        if not attention_modules(self.model):
            raise ValueError(
                f"{type(self.model).__name__} has no attention module to record: none of its modules has a boolean "
                f"`fused` attribute and an `attention_probs` child (the protocol of vit_pytorch.vit.Attention)"
            )

    def _install(self):
        self._saved_fused = []
        self._handles.append(self.model.register_forward_pre_hook(self._new_call))
        for name, module in attention_modules(self.model):
            self._saved_fused.append((module, module.fused))
            module.fused = False
            self._handles.append(module.attention_probs.register_forward_hook(self._recorder_for(name)))

    def _uninstall(self):
        super()._uninstall()
        for module, fused in getattr(self, '_saved_fused', []):
            module.fused = fused
        self._saved_fused = []

    def _new_call(self, module, args):
        self.maps, self.names = [], []
        image = args[0] if args else None
        self.image_size = tuple(image.shape[-2:]) if hasattr(image, 'shape') and image.ndim >= 2 else None

    def _recorder_for(self, name):
        def hook(module, args, output):
            attn = output.detach() if self.detach else output
            self.maps.append(attn if self.device is None else attn.to(self.device))
            self.names.append(name)
        return hook

    @property
    def attentions(self):
        """The latest call's maps: (b, layers, heads, n, n) if all shapes agree, else the list."""
        if not self.maps:
            return None
        if all(attn.shape == self.maps[0].shape for attn in self.maps):
            return rearrange(self.maps, 'layers b h i j -> b layers h i j')
        return list(self.maps)

    def _layout(self):
        if not self.maps:
            return None, None
        return token_layout(self.model, self.image_size, self.maps[-1].shape[-1])

    @property
    def grid(self):
        return self._layout()[0]

    @property
    def num_prefix_tokens(self):
        return self._layout()[1]

    def forward(self, img, *args, **kwargs):
        output = self._run(img, *args, **kwargs)
        return output, self.attentions


def _find_layer(model, layer, layer_name):
    if layer is not None:
        if not isinstance(layer, nn.Module):
            raise TypeError(f"layer must be a torch.nn.Module inside the model, got {type(layer).__name__}")
        return layer
    modules = dict(model.named_modules())
    if layer_name not in modules:
        children = ', '.join(name for name, _ in model.named_children())
        raise ValueError(
            f"layer_name {layer_name!r} is not a module of {type(model).__name__}; pass layer=<module> or "
            f"one of its module names (children: {children})"
        )
    return modules[layer_name]


class _Restore:
    """A handle whose remove() takes back a temporary `forward_features` wrapper."""

    def __init__(self, model, previous):
        self.model, self.previous = model, previous

    def remove(self):
        if self.previous is None:
            del self.model.forward_features
        else:
            self.model.forward_features = self.previous


class Extractor(_Hooks):
    """Capture the final tokens of `model`, or the output of any one of its modules.

    `Extractor(model)(img)` returns `(logits, embeddings)`, or the embeddings alone with
    `return_embeddings_only=True`, as vit-pytorch's Extractor does. By default the
    embeddings are what `model.forward_features` returns (for our ViTs all tokens after the
    final norm, (b, prefix + h * w, dim); for CrossViT the pair of branches), caught by
    wrapping that method while recording. `layer=<module>` or `layer_name='transformer'`
    (vit-pytorch's default) hooks that module instead; when it returns a tuple, its first
    element is taken. As a context manager it keeps `extractor.embeddings` from the latest
    call.
    """

    def __init__(self, model, *, layer=None, layer_name=None, return_embeddings_only=False, detach=True):
        super().__init__(model)
        if layer is None and layer_name is None and not hasattr(model, 'forward_features'):
            layer_name = 'transformer'
        self.layer = None if layer is None and layer_name is None else _find_layer(model, layer, layer_name)
        self.return_embeddings_only = return_embeddings_only
        self.detach = detach
        self.embeddings = None

    def _install(self):
        if self.layer is not None:
            self._handles.append(self.layer.register_forward_hook(self._capture))
            return
        previous, forward_features = self.model.__dict__.get('forward_features'), self.model.forward_features

        def capturing_forward_features(*args, **kwargs):
            output = forward_features(*args, **kwargs)
            self._keep(output)
            return output

        self.model.forward_features = capturing_forward_features
        self._handles.append(_Restore(self.model, previous))

    def _capture(self, module, args, output):
        self._keep(output[0] if isinstance(output, (tuple, list)) else output)

    def _keep(self, output):
        if self.detach:
            output = tuple(t.detach() for t in output) if isinstance(output, tuple) else output.detach()
        self.embeddings = output

    def forward(self, img, *args, **kwargs):
        self.embeddings = None
        output = self._run(img, *args, **kwargs)
        return self.embeddings if self.return_embeddings_only else (output, self.embeddings)


def forward_intermediates(model, img, indices=None, *, output='tokens', transformer=None):
    """`model.forward_intermediates(img, indices)`, for every model of the package: the token models' blocks
    (`output` 'tokens' or 'maps', as in `vit.TokenFace.forward_intermediates`), a multi-scale model's stages as
    (b, c, h, w) maps. A model without the method, or a `transformer=` given, is read by `block_outputs`.
    """
    method = getattr(model, 'forward_intermediates', None)
    if transformer is None and callable(method):
        if 'output' in inspect.signature(method).parameters:
            return method(img, indices=indices, output=output)
        if output not in ('tokens', 'maps'):
            raise ValueError(f"output must be 'tokens' or 'maps', got {output!r}")
        return method(img, indices=indices)      # a multi-scale model's stages are maps already
    return block_outputs(model, img, indices, output=output, transformer=transformer)
