"""The package's one compiled module, declared where setuptools supports it without warnings.

An execution's setup in one native call (retool/sandbox/_settle.c, docs/sandbox.md "How an execution
runs"). Optional: where no C compiler is found the package installs without it, and the sandbox makes
the same setup from Python (/readyz says which: isolation.execution_setup). Everything else about the
package is in pyproject.toml; setuptools' own table for extensions there
(``[tool.setuptools.ext-modules]``) is still experimental and warned about at every install.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "retool.sandbox._settle",
            sources=["retool/sandbox/_settle.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
