"""autoaccel in continuous integration: the GitHub Action's entry point (`python -m
autoaccel.ci.github`) and the git plumbing it needs."""
