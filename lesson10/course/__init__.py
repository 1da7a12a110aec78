"""The instructor's tools: :mod:`.build` (notebooks/ from solutions/), :mod:`.release`
(the student repository), :mod:`.selfstudy` (its self-study edition, solutions folded) and
:mod:`.grade` (the autograder, Gradescope and Classroom)."""
