"""On PYTHONPATH, a Python without Horovod (as on TensorFlow 2.19 and later, where it does not
build): importing it fails as it does where it is not installed."""
import importlib.abc
import sys


class _NoHorovod(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "horovod" or name.startswith("horovod."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoHorovod())
