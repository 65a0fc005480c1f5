"""Report figure 6: the family of nonlinear length-penalty curves f(x; k, q) (docs/SPEC.md §4).

f(x; k, q) = ((1 + kx)^(1-q) - 1) / (k(1-q)), and log(1 + kx)/k at q = 1
(`horizon.env.rewards.penalty_curve`). Left: several q at fixed k; middle: several k at
fixed q (normalised by f(x_max) so the shapes compare); right: the marginal cost
f'(x) = (1 + kx)^(-q). Writes length_penalty_curves.png to `output_dir` (configs/figures.py,
section `length_penalty`).

    python experiments/length_penalty_curves.py --config=configs/figures.py
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from horizon.env.rewards import penalty_curve, validate_curve_params
from horizon.utils import cli
from horizon.utils.config import ConfigError, need_float

FORMULA = r"$f(x;k,q)=\frac{(1+kx)^{1-q}-1}{k(1-q)}$,  $q{=}1$: $\log(1+kx)/k$"


def validate(c) -> None:
    lp = c.length_penalty
    need_float(lp, "x_max", "length_penalty", 0.0, lo_open=True)
    try:
        for q in lp.qs:
            validate_curve_params(lp.k_fixed, q)
        for k in lp.ks:
            validate_curve_params(k, lp.q_fixed)
    except ValueError as e:
        raise ConfigError(f"length_penalty: {e}") from None


def main(argv=None) -> None:
    c = cli.load(argv, default="configs/figures.py", validate=validate, doc=__doc__,
                 prog="experiments/length_penalty_curves.py")
    args = c.length_penalty
    out = pathlib.Path(c.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = jnp.linspace(0.0, args.x_max, 801)
    slope = jax.vmap(jax.grad(penalty_curve), in_axes=(0, None, None))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for q in args.qs:
        axes[0].plot(x, penalty_curve(x, args.k_fixed, q), label=f"q={q:g}")
        axes[2].plot(x, slope(x, args.k_fixed, q), label=f"k={args.k_fixed:g}, q={q:g}")
    axes[0].set(title=f"k = {args.k_fixed:g}, varying q", xlabel="effort x", ylabel="penalty f(x)")
    for k in args.ks:
        f = np.asarray(penalty_curve(x, k, args.q_fixed))
        axes[1].plot(x, f / f[-1], label=f"k={k:g}")
    axes[1].set(title=f"q = {args.q_fixed:g}, varying k (normalised f(x)/f(x_max))", xlabel="effort x",
                ylabel="f(x) / f(x_max)")
    axes[2].set(title="marginal cost f'(x) = (1+kx)^(-q)", xlabel="effort x", ylabel="f'(x)", yscale="log")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("Nonlinear length penalty (concave, increasing): " + FORMULA, fontsize=11)
    fig.tight_layout()
    path = out / "length_penalty_curves.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    for q in args.qs:
        vals = [float(penalty_curve(v, args.k_fixed, q)) for v in (10.0, 100.0, args.x_max)]
        print(f"k={args.k_fixed:g} q={q:g}: f(10)={vals[0]:.3f} f(100)={vals[1]:.3f} f({args.x_max:g})={vals[2]:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1:])
