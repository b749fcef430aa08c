"""Packaging beyond what pyproject.toml can say: templates/, targets/ and schedules/ stay
where they are in the checkout and ship inside the wheel as mlagen/_data/<folder>/
(mlagen.paths finds them in either place)."""

from pathlib import Path

from setuptools import find_packages, setup

DATA = ("templates", "targets", "schedules")
HERE = Path(__file__).resolve().parent


def data_packages(top: str) -> list[str]:
    """The folder and every folder under it, as the (data-only) packages setuptools wants."""
    dirs = [HERE / top] + sorted(p for p in (HERE / top).rglob("*")
                                 if p.is_dir() and "__pycache__" not in p.parts)
    return ["mlagen._data." + ".".join(d.relative_to(HERE).parts) for d in dirs]


data = [p for top in DATA for p in data_packages(top)]
setup(
    packages=find_packages(include=["mlagen", "mlagen.*"]) + data,
    package_dir={f"mlagen._data.{top}": top for top in DATA},
    package_data={**{p: ["*"] for p in data},
                  # the shipped tuned defaults; the C++ call path's source (fastcall.py)
                  "mlagen.backends.hopper": ["tuned.json", "fastcall.cpp"]},
)
