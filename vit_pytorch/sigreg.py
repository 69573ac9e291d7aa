"""SIGReg (sketched isotropic Gaussian regularisation; Balestriero and LeCun, "LeJEPA: Provable and Scalable
Self-Supervised Learning Without the Heuristics", arXiv 2511.08544): the Epps-Pulley statistic of random 1-D
projections of embeddings, which pulls them to an isotropic Gaussian.

LeJEPA's and LeVJEPA's regulariser (`vit_pytorch.lejepa`, which keeps these names), and the What-Where
Transformer's of its slots (`vit_pytorch.wwt`). A block of its own, beside vit.py: it is a loss, not a part of the
ViT, and it imports torch.distributed. It imports nothing of the package.

    import torch
    from vit_pytorch.sigreg import sigreg_loss

    sigreg_loss(torch.randn(256, 16))      # ~1.06 for Gaussian samples; 0.409 N for a collapsed batch (N samples)
"""

import torch
import torch.distributed as dist


def random_projections(dim, num_slices, *, device=None, dtype=None, generator=None):
    """`num_slices` random directions in `dim` dimensions, uniform on the sphere: (dim, num_slices), unit columns,
    drawn as the official LeJEPA code draws them (`torch.randn((dim, num_slices))` from the generator, normalised).

    Under torch.distributed every process uses rank 0's, so that their characteristic functions can be pooled.
    The column norms are summed over blocks of rows and the draw divided in place: `norm(dim=0)` of a
    (65336, 1024) draw (LeJEPA's K) is a strided reduction that took 1.2 s of its ~3 s training step on one core,
    the blocked sum 0.2 s, with no second copy of the 256 MiB draw (benchmarks/lejepa_step.py)."""
    directions = torch.randn(dim, num_slices, device=device, dtype=dtype, generator=generator)
    if distributed():
        dist.broadcast(directions, src=0)
    squares = sum(block.square().sum(dim=0) for block in directions.split(4096))
    return directions.div_(squares.sqrt())


def sigreg(x, projections, *, domain=(-5, 5), num_knots=17):
    """The Epps-Pulley statistic of each 1-D projection of samples `x` (..., n, d) on `projections` (d, m):
    (..., m). T = N * integral over `domain` of |ecf(t) - phi(t)|^2 phi(t) dt, phi(t) = exp(-t^2 / 2) the
    standard normal's characteristic function (and the weight), ecf(t) = mean_j exp(i t x_j) the samples', by
    the trapezoidal rule on `num_knots` equally spaced knots. Under torch.distributed, ecf and N are over every
    process's samples (the gradient flows back to each)."""
    samples = x.shape[-2] * (dist.get_world_size() if distributed() else 1)
    t = torch.linspace(*domain, num_knots, device=x.device, dtype=x.dtype)
    phi = (-t.square() / 2).exp()
    xt = torch.einsum('... n d, d m -> ... n m', x, projections.to(x.dtype))[..., None] * t    # (..., n, m, knots)
    ecf_real, ecf_imag = mean_over_processes(xt.cos().mean(dim=-3)), mean_over_processes(xt.sin().mean(dim=-3))
    distance = (ecf_real - phi).square() + ecf_imag.square()                 # |ecf - phi|^2, (..., m, knots)
    return samples * torch.trapezoid(distance * phi, t, dim=-1)


def sigreg_loss(x, num_slices=1024, domain=(-5, 5), num_knots=17, *, projections=None):
    """SIGReg of embeddings `x` (..., n, d): the Epps-Pulley statistic over `num_slices` random directions
    (`projections` (d, num_slices) if given, else drawn), averaged over the directions and the leading
    dimensions (the views)."""
    if projections is None:
        projections = random_projections(x.shape[-1], num_slices, device=x.device, dtype=x.dtype)
    return sigreg(x, projections, domain=domain, num_knots=num_knots).mean()


def distributed():
    return dist.is_available() and dist.is_initialized()


def mean_over_processes(x):
    """The mean of `x` over the processes under torch.distributed (differentiable), else `x`."""
    if not distributed():
        return x
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(x) / dist.get_world_size()
