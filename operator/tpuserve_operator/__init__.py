"""The kopf operator that turns TPUModelServer resources into model servers on GKE TPU pools."""
