"""triton_serving."""
