"""Matchers that several passes share (producers, activations, attention, masks, RoPE). They
import no pass: a pass that needs another's matcher finds it here."""
