"""LAB STAND-IN (tests only) for Pillow: ``from PIL import Image`` works, using it raises.

Upstream's utils/prompt_generation.py (imported at module level by utils/prompt_client.py up to v0.19.0) imports it for
the trace capture's random images.
"""
