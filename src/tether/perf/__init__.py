"""Performance modelling: the calibrated alpha-beta-gamma model of collectives."""
