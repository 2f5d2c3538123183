"""The study's model and preset names, importable without torch (the CLI parser needs them)."""

MODEL_NAMES = ("resnet18", "sa-quadratic", "sa-gaussian", "sa-learned", "sa-learned-content")
PRESET_NAMES = ("paper", "fast", "demo", "smoke")
# What each preset is sized for: training on a CPU with a "gpu" preset gets a warning and CPU_PRESET.
PRESET_DEVICES = {"paper": "gpu", "fast": "gpu", "demo": "cpu", "smoke": "cpu"}
# One line per preset for --help; presets.py's docstring and docs/cifar.rst have the settings.
PRESET_SUMMARIES = {
    "paper": "Cordonnier et al.'s recipe: full models, 300 epochs",
    "fast": "full models, short schedules: 30 (ResNet18) or 40 epochs",
    "demo": "reduced models, 2,000 training images, 3 epochs: about a minute per model",
    "smoke": "tiny models, 32 images, 1 epoch: seconds; checks that the pipeline runs",
}
# The first preset meant for a CPU whose accuracies still mean something (smoke's mean nothing).
CPU_PRESET = "demo"
DATA_ENV = "STRUCTCONV_DATA"  # the same as structconv.data.cifar.ENV (tested)
