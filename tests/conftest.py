import sys
from pathlib import Path

# Let tests import their shared helpers (tests/chip_configs.py).
sys.path.insert(0, str(Path(__file__).parent))
