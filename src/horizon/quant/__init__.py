"""horizon.quant."""
