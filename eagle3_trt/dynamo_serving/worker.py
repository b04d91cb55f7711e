"""``python -m eagle3_trt.dynamo_serving.worker --bundle BUNDLE``: one Dynamo worker process."""

from eagle3_trt.dynamo_serving.engine import main

if __name__ == "__main__":
    main()
