"""What both tiers share: text encoding, the model store, (later) the V2 codec and batcher."""
