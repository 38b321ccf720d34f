"""How far dfx scales, on paper: the model behind docs/SCALING.md.

profile      the measured figures' file, the queries and stages read of it
measure      taking the figures (`dfx run --analyze-json`, an S3 endpoint)
costs        fixed costs, the store, the exchange's requests and back-off
fit          a query's stages as lines in the scale factor
schedule     the scheduler's run, replayed
designs      a query at a target, as built or as designed with machine-sized tasks
predictions  the prediction tables
report       `model`: the checks, then the predictions
selfcheck    `check`: the request count against one worked by hand

`scripts/scaling-model.py` is the command; only `measure-s3` needs more
than the standard library (boto3).
"""
