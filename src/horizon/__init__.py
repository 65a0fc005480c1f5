"""horizon: a functional JAX reproduction of a frontier agentic-coding training recipe.

See docs/ARCHITECTURE.md for the module map (which file implements which SPEC section).
"""

__version__ = "0.1.0"
