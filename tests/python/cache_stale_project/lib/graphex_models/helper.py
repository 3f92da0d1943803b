def helper(x):
    return x * 2
