print("hello, wprld")
