"""What the methods share: masks, selection, block-sparse attention, the decode path, stages, devices."""
