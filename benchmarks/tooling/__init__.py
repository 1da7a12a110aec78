"""Benchmarks of the course's own tooling, kept out of the installed package (a student's
install has no use for them): :mod:`.grade` (what the autograder costs next to one nbclient
run of the notebooks), :mod:`.classroom` (a generated class graded: notebooks a minute, CPU
a notebook) and :mod:`.figures` (one redraw of each interactive figure). Run them from a
checkout: ``python -m lesson10 bench grade|class|figures`` (or ``python -m
benchmarks.tooling.grade`` from the repository's root). Tables land in ``benchmarks/results/``.
"""
