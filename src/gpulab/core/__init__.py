"""The measurement core: the device, timing, energy, ceilings, the op registry and the table schemas."""
