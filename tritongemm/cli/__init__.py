"""``tritongemm tune|explain|cache`` (also ``python -m tritongemm``)."""
