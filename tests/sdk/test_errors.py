"""Errors: one module per package, every class under FairpostError, the tree in
each module's docstring: one root, the hierarchy drawn where it is defined."""

from __future__ import annotations

import importlib
import pkgutil
import re
from types import ModuleType

import pytest

from fairpost.config.errors import FairpostError

PACKAGES = ("fairpost", "fairpost.config", "fairpost.dispatcher", "fairpost.mailer")
ERROR_MODULES = ("fairpost.config.errors", "fairpost.dispatcher.errors", "fairpost.mailer.errors")


def product_modules() -> list[ModuleType]:
    modules = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            if not info.name.endswith("__main__"):
                modules.append(importlib.import_module(info.name))
    return modules


def defined_errors(module: ModuleType) -> list[type[BaseException]]:
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
    ]


def test_every_error_is_a_fairpost_error_defined_in_its_packages_errors_module() -> None:
    errors = {error for module in product_modules() for error in defined_errors(module)}
    assert errors, "no error classes found: the walk is broken"
    assert sorted(e.__qualname__ for e in errors if not issubclass(e, FairpostError)) == []
    assert (
        sorted(f"{e.__module__}.{e.__qualname__}" for e in errors if e.__module__ not in ERROR_MODULES) == []
    )


def test_poison_message_is_a_fairpost_error_not_a_value_error() -> None:
    from fairpost.mailer.errors import PoisonMessage

    assert issubclass(PoisonMessage, FairpostError)
    assert not issubclass(PoisonMessage, ValueError)


@pytest.mark.parametrize("name", ERROR_MODULES)
def test_each_errors_docstring_draws_every_class_it_defines(name: str) -> None:
    module = importlib.import_module(name)
    doc = module.__doc__ or ""
    drawn = set(re.findall(r"(?:^[ │]+|── )([A-Z]\w+)", doc, re.M))
    assert {e.__name__ for e in defined_errors(module)} <= drawn


def test_the_default_message_is_the_docstring() -> None:
    from fairpost.dispatcher.errors import DispatchError

    assert str(DispatchError()) == "The dispatcher failed."
