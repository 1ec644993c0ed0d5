"""The pool description, the bottom layer: its schema (model), the hardware catalogue,
the rules every description must pass, facts derived from it, and the loader that turns a
stack into a validated Description. Imports nothing else of gpupool."""
