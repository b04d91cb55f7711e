"""dynamo_serving."""
