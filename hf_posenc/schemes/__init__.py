"""One module per scheme, each registering itself on import (`register_scheme` on its last line); importing this
package imports every module in it, so a new scheme is one new file here."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
