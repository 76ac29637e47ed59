"""What a runner worker executes: tuning with the optimizer, the optimized suite, the model run, and
the optimizer's evaluator adapter. The only package that imports both the judge (`runners`) and
the judged party (`optimizer`); neither of those imports this one.
"""
