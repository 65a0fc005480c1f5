"""Report figure 6: the family of nonlinear length-penalty curves f(x; k, q) (SPEC §4).

f(x; k, q) = ((1 + kx)^(1-q) - 1) / (k(1-q)), and log(1 + kx)/k at q = 1
(`horizon.rl.rewards.penalty_curve`). Left: several q at fixed k; middle: several k at
fixed q (normalised by f(x_max) so the shapes compare); right: the marginal cost
f'(x) = (1 + kx)^(-q). Writes length_penalty_curves.png to --output_dir.

    python experiments/length_penalty_curves.py --output_dir runs/figures
"""

from __future__ import annotations

import argparse
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from horizon.rl.rewards import penalty_curve

FORMULA = r"$f(x;k,q)=\frac{(1+kx)^{1-q}-1}{k(1-q)}$,  $q{=}1$: $\log(1+kx)/k$"


def _floats(s: str) -> list[float]:
    return [float(v) for v in s.split(",") if v]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--output_dir", default="runs/figures")
    ap.add_argument("--x_max", type=float, default=200.0, help="effort axis range (e.g. tool-call equivalents)")
    ap.add_argument("--k_fixed", type=float, default=0.05)
    ap.add_argument("--qs", default="0,0.25,0.5,0.75,1,1.5")
    ap.add_argument("--q_fixed", type=float, default=0.5)
    ap.add_argument("--ks", default="0.005,0.02,0.05,0.2,1")
    args = ap.parse_args()
    out = pathlib.Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = jnp.linspace(0.0, args.x_max, 801)
    slope = jax.vmap(jax.grad(penalty_curve), in_axes=(0, None, None))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for q in _floats(args.qs):
        axes[0].plot(x, penalty_curve(x, args.k_fixed, q), label=f"q={q:g}")
        axes[2].plot(x, slope(x, args.k_fixed, q), label=f"k={args.k_fixed:g}, q={q:g}")
    axes[0].set(title=f"k = {args.k_fixed:g}, varying q", xlabel="effort x", ylabel="penalty f(x)")
    for k in _floats(args.ks):
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
    for q in _floats(args.qs):
        vals = [float(penalty_curve(v, args.k_fixed, q)) for v in (10.0, 100.0, args.x_max)]
        print(f"k={args.k_fixed:g} q={q:g}: f(10)={vals[0]:.3f} f(100)={vals[1]:.3f} f({args.x_max:g})={vals[2]:.3f}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
