"""Multimodal inputs shared by the gateway and the engine: image preprocessing (Pillow + numpy only, so the gateway
imports it without torch) and the placeholder spans a prompt's media occupy."""
