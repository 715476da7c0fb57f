"""Images in chat requests: where an image_url may come from (sources.py), decoding and validating it once with
Pillow and hashing the decoded pixels (images.py), and what the served model makes of it (processor.py:
placeholder tokens, resizing to the tower's input, the media spans that travel with the prompt)."""
