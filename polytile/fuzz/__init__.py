"""Differential fuzzing of polytile: random programs under random schedules, each built and run in
its own process and compared with an independent NumPy reference (``polytile fuzz``).

Modules, in the order a case goes through them: ``programs`` draws a program (``spec`` holds it as
data and renders it as Python), ``inputs`` draws its inputs, ``reference`` evaluates it,
``schedules`` draws and applies primitives, ``execute`` builds, runs and classifies one case,
``runner`` isolates cases in processes and runs campaigns, ``minimize`` shrinks a failing case,
``cli`` is the command.
"""
