"""Stage 3: decode, resize, colour -> class. Pure functions of one sample."""
