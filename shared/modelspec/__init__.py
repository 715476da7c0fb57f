"""What every process must agree on about a model, computed without an engine (standard library, numpy and
Pillow only; torch and transformers only inside the bundled models' one-time preparation):

    bundled.py           where the bundled models are, prepared once into plain Hugging Face directories
    block_hash.py        the chained hash that names a page of KV (engines publish it, the gateway routes on it)
    image_processor.py   how an image becomes the vision tower's pixels (fit at the gateway, normalize at the tower)
    vlm_config.py        what a LLaVA-style model's config.json says about images

A leaf package: it imports nothing of pdrelay, so the gateway, the engine and the encoder all import it and none
of them imports another's internals.
"""
