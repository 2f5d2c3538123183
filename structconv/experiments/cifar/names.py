"""The study's model and preset names, importable without torch (the CLI parser needs them)."""

MODEL_NAMES = ("resnet18", "sa-quadratic", "sa-gaussian", "sa-learned", "sa-learned-content")
PRESET_NAMES = ("paper", "fast", "demo", "smoke")
DATA_ENV = "STRUCTCONV_DATA"  # the same as structconv.data.cifar.ENV (tested)
