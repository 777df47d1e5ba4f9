print("goodbey")
