"""The instructor's tools: :mod:`.build` (notebooks/ from solutions/), :mod:`.release`
(the student repository) and :mod:`.grade` (the autograder, Gradescope and Classroom)."""
