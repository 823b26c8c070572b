"""Pure performance modelling: hardware profiles, cost models and simulation, which predict
without running anything. Measuring on a live group (the collectives' calibration) is part of the
communication layer: :mod:`tether.comm.calibration`."""
